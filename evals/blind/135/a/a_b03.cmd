deepspeed --num_gpus 2 --master_port 49015 a_b03.py
