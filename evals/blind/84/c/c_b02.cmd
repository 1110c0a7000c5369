python c_b02.py --port 38203
