class SomethingElse:
    def execute(self, requests):
        return []
