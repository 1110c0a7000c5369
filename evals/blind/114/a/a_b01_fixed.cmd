accelerate launch --num_processes 2 --main_process_port 49012 a_b01_fixed.py
