accelerate launch --num_processes 2 --main_process_port 49018 a_c02.py
