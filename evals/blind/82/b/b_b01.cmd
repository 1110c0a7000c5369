deepspeed --num_gpus 2 --master_port 33101 b_b01.py
