deepspeed --num_gpus 2 --master_port 49161 b_c03.py
