deepspeed --num_gpus 2 --master_port 49132 b_b03_fixed.py
