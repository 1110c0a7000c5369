deepspeed --num_gpus 2 --master_port 49012 a_b01_fixed.py
