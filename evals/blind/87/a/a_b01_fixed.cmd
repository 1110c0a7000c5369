accelerate launch --multi_gpu --num_processes 2 --main_process_port 39002 a_b01_fixed.py
