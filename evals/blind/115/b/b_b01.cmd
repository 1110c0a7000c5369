deepspeed --num_gpus 2 --master_port 49111 b_b01.py
