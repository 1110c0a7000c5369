deepspeed --num_gpus 2 --master_port 49004 a_b02_fixed.py
