deepspeed --num_gpus 2 --master_port 49041 a_c01.py
