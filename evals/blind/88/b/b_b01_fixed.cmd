python b_b01_fixed.py
