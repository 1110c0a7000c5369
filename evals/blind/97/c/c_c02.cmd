python c_c02.py 49208
