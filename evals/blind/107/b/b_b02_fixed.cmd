python b_b02_fixed.py 49112
