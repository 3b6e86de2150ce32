"""planner.profile"""
