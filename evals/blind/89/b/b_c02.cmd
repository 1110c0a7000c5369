deepspeed --num_gpus 2 --master_port 41108 b_c02.py
