from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination


class PagePagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request):
        """As DRF's (sizes above the maximum are capped), but a size that is no positive whole
        number is a 400 rather than silently the default."""
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and not (raw.isdigit() and int(raw) > 0):
            raise ValidationError(
                {
                    self.page_size_query_param: [
                        f"Must be a whole number from 1 to {self.max_page_size}."
                    ]
                }
            )
        return super().get_page_size(request)

    def get_page_number(self, request, paginator):
        """As DRF's, but ``?page=`` left blank is a 400, not silently the first page."""
        if request.query_params.get(self.page_query_param) == "":
            raise ValidationError({self.page_query_param: ["A page number from 1."]})
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view):
        """The schema says what ``get_page_size`` and the page lookup refuse."""
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] in (self.page_query_param, self.page_size_query_param):
                parameter["schema"]["minimum"] = 1
        return parameters
