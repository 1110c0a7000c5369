python b_b01.py
