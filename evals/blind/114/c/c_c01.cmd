deepspeed --num_gpus 2 --master_port 49217 c_c01.py
