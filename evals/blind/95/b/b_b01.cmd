deepspeed --num_gpus 2 --master_port 48101 b_b01.py
