deepspeed --num_gpus 2 --master_port 41102 b_b01_fixed.py
