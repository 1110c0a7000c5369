deepspeed --num_gpus 2 --master_port 49031 a_c01.py
