deepspeed --num_gpus 2 --master_port 42101 b_b01.py
