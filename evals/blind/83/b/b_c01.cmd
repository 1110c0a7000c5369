deepspeed --num_gpus 2 --master_port 34107 b_c01.py
