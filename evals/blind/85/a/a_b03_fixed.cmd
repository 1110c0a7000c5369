accelerate launch --num_processes 2 --main_process_port 38404 a_b03_fixed.py
