python c_c02.py --port 49208
