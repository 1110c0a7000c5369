deepspeed --num_gpus 2 --master_port 41106 b_b03_fixed.py
