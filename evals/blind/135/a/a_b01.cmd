deepspeed --num_gpus 2 --master_port 49011 a_b01.py
