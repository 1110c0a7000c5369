python c_b02.py --port 49221
