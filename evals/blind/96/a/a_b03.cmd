accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no --dynamo_backend no --main_process_ip 127.0.0.1 --main_process_port 49031 a_b03.py
