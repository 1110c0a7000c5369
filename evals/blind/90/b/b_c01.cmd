deepspeed --num_gpus 2 --master_port 42111 b_c01.py
