deepspeed --num_gpus 2 --master_port 41105 b_b03.py
