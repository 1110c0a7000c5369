deepspeed --num_gpus 2 --master_port 49212 c_b01_fixed.py
