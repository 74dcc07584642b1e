"""The rollout controller: one step at a time towards what a deployment wants, by its strategy's
plan, judged by the new version's health; and the status people read.
"""
