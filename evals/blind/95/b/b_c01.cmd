deepspeed --num_gpus 2 --master_port 48107 b_c01.py
