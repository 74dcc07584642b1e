class TritonPythonModel:
    async def is_ready(self):
        return False

    def execute(self, requests):
        return []
