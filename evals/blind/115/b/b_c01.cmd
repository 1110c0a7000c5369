deepspeed --num_gpus 2 --master_port 49141 b_c01.py
