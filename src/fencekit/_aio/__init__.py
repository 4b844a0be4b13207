"""asyncio support shared by every long-running part (private): the task scope every
background task starts in, and the periodic loop that never dies.
"""
