deepspeed --num_gpus 2 --master_port 39107 b_c01.py
