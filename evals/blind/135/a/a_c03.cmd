deepspeed --num_gpus 2 --master_port 49019 a_c03.py
