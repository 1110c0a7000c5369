deepspeed --num_gpus 2 --master_port 34104 b_b02_fixed.py
