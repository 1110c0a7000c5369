deepspeed --num_gpus 2 --master_port 49016 a_b03_fixed.py
