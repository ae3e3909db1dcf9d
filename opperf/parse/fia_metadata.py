"""placeholder"""
def add_fia_profile_metadata(database, inputs):
    return None
