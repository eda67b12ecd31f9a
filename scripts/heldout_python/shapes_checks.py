"""Tests for a small geometry module, written in pytest style."""
import math

import pytest


class Circle:
    def __init__(self, radius):
        if radius < 0:
            raise ValueError("radius must not be negative")
        self.radius = radius

    def area(self):
        return math.pi * self.radius ** 2

    def perimeter(self):
        return 2 * math.pi * self.radius


class Rectangle:
    def __init__(self, width, height):
        if width < 0 or height < 0:
            raise ValueError("sides must not be negative")
        self.width, self.height = width, height

    def area(self):
        return self.width * self.height

    def perimeter(self):
        return 2 * (self.width + self.height)

    def is_square(self):
        return self.width == self.height


@pytest.fixture
def unit_square():
    return Rectangle(1, 1)


def test_circle_area_grows_with_the_square_of_the_radius():
    assert Circle(2).area() == pytest.approx(4 * Circle(1).area())


def test_circle_perimeter():
    assert Circle(0.5).perimeter() == pytest.approx(math.pi)


@pytest.mark.parametrize("radius", [-1, -0.001])
def test_negative_radius_is_refused(radius):
    with pytest.raises(ValueError, match="radius"):
        Circle(radius)


def test_unit_square(unit_square):
    assert unit_square.area() == 1
    assert unit_square.perimeter() == 4
    assert unit_square.is_square()


@pytest.mark.parametrize("width,height,area", [(2, 3, 6), (0, 5, 0), (1.5, 2, 3.0)])
def test_rectangle_area(width, height, area):
    assert Rectangle(width, height).area() == pytest.approx(area)


def test_a_rectangle_is_not_always_a_square():
    assert not Rectangle(2, 3).is_square()
