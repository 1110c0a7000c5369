deepspeed --num_gpus 2 --master_port 49102 b_b01_fixed.py
