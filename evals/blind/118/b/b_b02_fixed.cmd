accelerate launch --num_processes 2 --main_process_ip 127.0.0.1 --main_process_port 49122 b_b02_fixed.py
