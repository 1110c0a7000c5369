accelerate launch --multi_gpu --num_processes 2 --main_process_ip 127.0.0.1 --main_process_port 49031 a_b03.py
