accelerate launch --num_processes 2 --main_process_ip 127.0.0.1 --main_process_port 49121 b_b02.py
