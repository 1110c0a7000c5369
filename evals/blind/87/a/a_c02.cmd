accelerate launch --multi_gpu --num_processes 2 --main_process_port 39008 a_c02.py
