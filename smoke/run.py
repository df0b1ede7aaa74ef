print("smoke placeholder")
