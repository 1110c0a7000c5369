deepspeed --num_gpus 2 --master_port 49022 a_b02_fixed.py
