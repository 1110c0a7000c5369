python b_b03_fixed.py
