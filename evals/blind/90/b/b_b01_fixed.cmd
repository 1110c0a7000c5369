deepspeed --num_gpus 2 --master_port 42102 b_b01_fixed.py
