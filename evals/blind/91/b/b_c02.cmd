deepspeed --num_gpus 2 --master_port 43141 b_c02.py
