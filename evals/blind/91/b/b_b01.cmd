deepspeed --num_gpus 2 --master_port 43101 b_b01.py
