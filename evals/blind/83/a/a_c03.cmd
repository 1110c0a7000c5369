accelerate launch --num_processes 2 --main_process_port 34009 a_c03.py
