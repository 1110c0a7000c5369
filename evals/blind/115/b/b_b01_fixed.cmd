deepspeed --num_gpus 2 --master_port 49112 b_b01_fixed.py
