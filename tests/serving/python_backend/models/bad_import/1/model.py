import a_module_that_does_not_exist  # noqa: F401


class TritonPythonModel:
    def execute(self, requests):
        return []
