deepspeed --num_gpus 2 --master_port 49107 b_c01.py
